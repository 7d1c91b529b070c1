"""What a build leaves behind: manifest and artifacts, lockfile, gates, reports."""
