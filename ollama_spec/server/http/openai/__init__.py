"""OpenAI's routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings. Their
request models and answers: protocol/openai.py, protocol/openai_answers.py."""
