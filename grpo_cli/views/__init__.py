"""Views of the records: JSON (:mod:`.json`), tables (:mod:`.tables`), CI formats
(:mod:`.ci`) and figures (:mod:`.plot`). A view imports records only."""
