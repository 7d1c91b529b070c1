"""The build: plan, evaluate candidates, build targets, locked builds."""
