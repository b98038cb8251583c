"""What commands write into a workdir and read back: atomic files, the long
`step,seed,name,value` tables, and the run logs and summaries."""
