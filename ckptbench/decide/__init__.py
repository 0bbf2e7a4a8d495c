"""Deciding from measurements (pure, no I/O): pre-flight verdicts with ranges (:mod:`.verdict`) and settings
advised from result files (:mod:`.advice`)."""
