"""The crash-proof Spark demo (`semel demo`): processor, verifier and the crash loop."""
