"""What a person looks at: the status page at `/`, `gpuwatch report` and `gpuwatch status`."""
