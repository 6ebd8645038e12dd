"""The serving core, below both APIs and knowing neither: the server's state and settings, the pairs the store
serves (the scheduler, what is resident, room for one more), the worker that runs a pair, request building."""
