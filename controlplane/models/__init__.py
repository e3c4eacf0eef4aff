"""Models: the repository's metadata schema, the events of a model's stream, its versions and
aliases as pure functions over those events, and how references and visibility resolve."""
