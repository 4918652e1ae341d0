"""GPU node health handed to the tools that act on nodes: Node Problem Detector (a custom
plugin, `gpuwatch npd`) and NVSentinel (HealthEvents to its platform connector). gpuwatch
judges; those tools cordon, drain and reboot, with fleet-wide limits a host cannot see."""
