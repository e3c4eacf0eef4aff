"""Jobs: the manifest users submit, the lifecycle as pure functions over events, and views."""
