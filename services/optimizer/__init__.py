"""Deployment planning: E3 split/replica plans over device classes, exit-wrapper ramp choice."""
