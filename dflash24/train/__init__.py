"""Training DFlash drafters for a GGUF target (`dflash24 train-draft`)."""
