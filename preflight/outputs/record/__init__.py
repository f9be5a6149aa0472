"""What stays of runs on the node: the last report and what it vouches for, the record of a run under way, the history and its trends."""
