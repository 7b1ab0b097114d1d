"""The fold: mergeable partials of one pass over the batches (parts, the token partial,
pass 1, the loss and correction part, a recorded step's loss calls)."""
