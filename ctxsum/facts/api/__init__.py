"""Key facts over REST: the routes (``urls``, joined to the core's API through
``FactsConfig.ctxsum_api_urls``), their views and serializers, and the fact's not-found
answer (``errors``, registered with the core's error mapping)."""
