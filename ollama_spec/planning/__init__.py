"""Planning before anything loads: devices, what a pair needs in memory, whether it fits."""
