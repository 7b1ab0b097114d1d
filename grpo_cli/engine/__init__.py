"""The engines that fold a plan: this machine's threads (:mod:`.local`) or Ray tasks
(:mod:`.ray`), with the options they take (:mod:`.options`)."""
