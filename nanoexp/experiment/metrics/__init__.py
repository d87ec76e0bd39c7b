"""What each metric is (the registry) and how it is computed from finished requests and steps."""
