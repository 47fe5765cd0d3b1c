"""The environment variables the suite reads, named once: the command line's entry point reads them before it
imports anything heavy (suite/commands/main.py), and the modules that use them import them from here."""

DATA_ENV = "PLCQL_DATA_DIR"  # where datasets live (--data-dir)
RESULTS_ENV = "PLCQL_RESULTS_DIR"  # where run results live (--results-dir)
OMAR_PREY_ENV = "PLCQL_OMAR_PREY_DIR"  # the folder holding OMAR's pretrained prey files (--omar-prey)
