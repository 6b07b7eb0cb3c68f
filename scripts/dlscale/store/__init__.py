"""Measurements on disk: the versioned metrics format of one cell (`metrics`: where metrics are
written; `metrics_summary`: a cell's summary record from its ranks), the measurement folders
that keep every repetition (`measurements`), the "does not fit at this size" records of ranks
that ran out of memory (`does_not_fit`), one archive per study (`study_archive`) and the
migration of older results layouts (`migrate`)."""
