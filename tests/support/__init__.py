"""What the tests share: model and graph builders, engines on disk, markers, the CLI."""
