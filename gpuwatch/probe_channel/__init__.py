"""The directory/file protocol between the gpuwatch daemon and in-process probes: settings
(config), record and request file formats with their careful I/O (protocol), and the daemon's
side of requests (requests). Shared by both sides; importing it never starts a probe nor
imports torch.
"""
