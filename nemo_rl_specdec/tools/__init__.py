"""Command-line tools users run: `time_forward` (timed forwards, to fit a hardware profile) and
`train_eagle3` (an Eagle3 head for a policy; `bench --suite hybrid` builds one with it), with the
loop it shares (`draft_training`). They import the package; nothing in it imports them. The
development tools (tiny-asset trainers, device and cost checks) live in the repository's top-level
tools/, outside the wheel."""
