"""ctxsum.facts: key facts beside the summary, an optional app. Add ``"ctxsum.facts"`` to
``INSTALLED_APPS`` after ``"ctxsum"``; it joins the core through ``ctxsum.hooks``."""
