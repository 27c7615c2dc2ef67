"""`offline-eval view`: a local web app to browse, explain, label and compare results files.

- index.py: a byte-offset index of a JSONL results file (records are read from disk a page at a time)
- labels_store.py: the reviewer's labels, saved crash-safe in the format `compare --labels` reads
- server.py: the JSON API and the page, on the standard library's ThreadingHTTPServer
- page.html: the one self-contained page (inline CSS and JS, nothing fetched)
"""
