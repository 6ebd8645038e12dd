"""Open WebUI's chat request, in the shape its default chat sends it (0.12, native function calling):
its built-in tools with every chat (36 of them, about 26 KB of JSON), a system prompt, and the whole
history so far. Written after its source's tool list; the wording is ours."""

from __future__ import annotations

import json

# (name, what it does, its parameters: name -> (JSON type, description)); the first is required
BUILTIN = [
    ("search_web", "Search the public web and return the top results with titles, links and snippets", "query"),
    ("fetch_url", "Fetch a web page and return its readable text, without scripts or markup", "url"),
    ("generate_image", "Generate an image from a text description with the configured image engine", "prompt"),
    ("edit_image", "Edit an image the user attached, following a description of the change", "prompt"),
    ("search_memories", "Search what the assistant was asked to remember about this user", "query"),
    ("add_memory", "Remember a fact about the user for later chats", "content"),
    ("replace_memory_content", "Replace the text of one remembered fact", "memory_id"),
    ("delete_memory", "Forget one remembered fact", "memory_id"),
    ("get_current_timestamp", "The current date and time in the user's time zone", "timezone"),
    ("calculate_timestamp", "A date and time some days, hours or minutes from now or from a given time", "offset"),
    ("search_notes", "Search the user's notes by title and content", "query"),
    ("view_note", "Read one of the user's notes in full", "note_id"),
    ("write_note", "Create a note with a title and Markdown content", "title"),
    ("replace_note_content", "Replace the content of one of the user's notes", "note_id"),
    ("search_chats", "Search the user's earlier chats by title and messages", "query"),
    ("view_chat", "Read an earlier chat's messages", "chat_id"),
    ("list_knowledge_bases", "List the knowledge bases this user can read", "page"),
    ("search_knowledge_bases", "Search the knowledge bases' names and descriptions", "query"),
    ("query_knowledge_bases", "Retrieve the passages of the knowledge bases closest to a question", "query"),
    ("search_knowledge_files", "Search the files of a knowledge base by name", "query"),
    ("view_knowledge_file", "Read one file of a knowledge base", "file_id"),
    ("query_knowledge_files", "Retrieve the passages of the given files closest to a question", "query"),
    ("list_channels", "List the channels this user belongs to", "page"),
    ("search_channel_messages", "Search the messages of the user's channels", "query"),
    ("view_channel_message", "Read one channel message and its thread", "message_id"),
    ("send_channel_message", "Post a message to a channel", "channel_id"),
    ("execute_code", "Run Python code in the sandbox and return its output and any files it wrote", "code"),
    ("list_files", "List the files attached to this chat", "page"),
    ("view_file", "Read one file attached to this chat", "file_id"),
    ("create_file", "Write a file and attach it to this chat", "filename"),
    ("list_models", "List the models this user can chat with", "page"),
    ("ask_model", "Ask another model a question and return its answer", "model_id"),
    ("create_task", "Add a task to the user's task list", "title"),
    ("list_tasks", "List the user's open tasks", "page"),
    ("complete_task", "Mark one of the user's tasks done", "task_id"),
    ("translate_text", "Translate text into another language", "text"),
]

SYSTEM = (
    "You are a helpful assistant inside Open WebUI. Answer in Markdown. Use the tools when they help: "
    "search before you answer questions about recent events, and cite the sources you used."
)


def builtin_tools() -> list[dict]:
    """The built-in tools, as OpenAI-shaped function definitions."""
    return [_tool(name, does, first) for name, does, first in BUILTIN]


def _tool(name: str, does: str, first: str) -> dict:
    properties = {
        first: {"type": "string", "description": f"The {first.replace('_', ' ')} this call is about. {does}."},
        "limit": {"type": "integer", "description": "How many results to return at most (default 5, at most 50)."},
        "offset": {"type": "integer", "description": "How many results to skip, to page through long lists."},
        "detail": {
            "type": "string",
            "enum": ["brief", "normal", "full"],
            "description": "How much of each result to include: a line, a paragraph, or all of it.",
        },
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{does}. Only call it when the user's request needs it; otherwise answer directly.",
            "parameters": {"type": "object", "properties": properties, "required": [first]},
        },
    }


def history(turns: int, words: int = 40) -> list[dict]:
    """`turns` earlier exchanges (a user message and the assistant's answer), each about `words` words."""
    messages = []
    for i in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {i}: " + "tell me more about the harbour " * (words // 6)}
        )
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "the boats come in at dawn " * (words // 6)})
    return messages


def chat(turns: int, latest: str = "And what happens at night?", words: int = 40) -> list[dict]:
    """The messages of a chat `turns` exchanges long (of about `words` words each way), with its system
    prompt and the latest question."""
    return [{"role": "system", "content": SYSTEM}, *history(turns, words), {"role": "user", "content": latest}]


if __name__ == "__main__":
    print(len(builtin_tools()), "tools,", len(json.dumps(builtin_tools())), "bytes of JSON")
