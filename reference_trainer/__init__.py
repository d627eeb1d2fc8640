"""A hybrid-parallel GPT trainer, installed as `distdoctor.reference_trainer`."""
