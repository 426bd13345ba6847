"""This code's release: semantic versioning from 1.0.0, the first release with a compatibility promise (CHANGELOG.md,
docs/fleet.md § Upgrading a fleet). ``pyproject.toml`` names the same version (a test holds them equal); each host's
lease records it, and ``supervisor --version`` prints it."""

RELEASE = "1.1.0"
