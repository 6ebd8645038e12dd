"""Prompts: chat templates (rendered in a bounded sandbox), tools, thinking, streamed text."""
