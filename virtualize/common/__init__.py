"""What both ends read: the call table, the wire, CUresult codes, errors, and the C tables' generator."""
