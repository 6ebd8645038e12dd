"""The engine: loads a pair and turns requests into token streams with their statistics."""
