"""ctxsum as the memory of agent frameworks, each an optional extra:

- ``ctxsum.integrations.openai_agents``: ``CtxsumSession``, a session of the OpenAI Agents
  SDK (``pip install ctxsum[agents]``);
- ``ctxsum.integrations.langchain``: ``CtxsumChatMessageHistory`` and ``CtxsumMiddleware``
  for LangChain (``pip install ctxsum[langchain]``).

Both store through ``ctxsum.services`` and read through ``ctxsum.selectors``, like any
other code of yours (docs/architecture.md, "Agent frameworks").
"""
