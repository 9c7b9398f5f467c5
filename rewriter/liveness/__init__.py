"""Is the fix live? doctor, the probe, the live plugin, the change record."""
