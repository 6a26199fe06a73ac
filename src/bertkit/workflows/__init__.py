"""What each command runs, from its settings to its output directory: pretrain, finetune, glue, embedding,
predict, extract, adapt; the budget-aware recipes and the fine-tuning run directory's bookkeeping.

A workflow prepares the run (device, precision, process group, allocator, the model placed, wrapped and
compiled) and hands `bertkit.train.fit` a model ready to train; task kinds come from `bertkit.tasks`."""
