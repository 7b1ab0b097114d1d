"""Recorders that run inside a trainer and write each step's rollouts for grpo-cli.

One module per trainer (:mod:`grpo_cli.integrations.trl`, ``.verl``, ``.openrlhf``), all
writing the recorded-run layout of :mod:`grpo_cli.integrations._writer`. Importing a
module here imports neither torch nor the trainer: they are imported when a trainer or a
batch is passed. A recorder never stops a training run: a failure while recording is one
warning, and recording stops.
"""
