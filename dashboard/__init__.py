"""The Dash dashboard of a diagnosis (``mixdiag dashboard``, ``mixdiag demo``).

``create_app(DashboardConfig(...))`` (:mod:`.app`, config in :mod:`.settings`) builds the app:
the frame (:mod:`.shell`) and one module per page (:mod:`.pages`); data access
(:mod:`.store`, uploads parsed in a child process by :mod:`.isolate`); page numbers
(:mod:`.stats`) and page data (:mod:`.page_data`); figure builders (:mod:`.figures`,
:mod:`.downsample`), shared Dash pieces (:mod:`.components`) and browser screenshots
(:mod:`.screenshot`). The ``/metrics`` it serves is :mod:`mixdiag.exporter`'s. Dash is imported
only by the app, the frame, the pages and the components.
"""
