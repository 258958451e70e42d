"""`ragtoll demo`: a small RAG stack (retriever, reranker, scripted LLM) and an agent, all on loopback.

Nothing here is imported by the proxy itself; the CLI imports `runner` lazily.
"""
