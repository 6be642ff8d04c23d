"""The accuracy bars the validation scripts score against (the issue tracker's acceptance):
aggregated serving, held out by GPU system and by release, median |predicted / measured - 1|;
disaggregated serving, every row. One home: validate_silicon (silicon_loso), validate_disagg
and accuracy_summary read them here."""

AGG_BARS = {"ttft": 0.30, "tpot": 0.15}
PD_BARS = {"predicted": 0.90, "tpot": 0.15, "ttft": 0.35}
