"""Views of the records: JSON (:mod:`.json`), tables (:mod:`.tables`), the HTML report
(:mod:`.html`), CI formats (:mod:`.ci`) and figures (:mod:`.plot`); every number a person
reads written by :mod:`.format`, the one screen's rows shared by :mod:`.summary`. A view
imports records only."""
