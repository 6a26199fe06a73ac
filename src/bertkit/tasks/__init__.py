"""Tasks: one module per task (pretraining, classification, tagging, squad, multiple_choice, ...), each
holding its head wiring, loss, metrics and post-processing; import the module you need."""
