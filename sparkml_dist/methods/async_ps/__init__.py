"""train.strategy=async, one method in one folder: its keys (`config`), the driver side that
launches and reads the ranks (`method`), the rank program (`worker`: parameter servers and
asynchronous workers) and the authenticated TCP wire between them (`wire`)."""
