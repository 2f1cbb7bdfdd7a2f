"""The case model: what a conformance problem is (Case, dtypes, inputs, output names, profiles, case files).

The lowest layer: it imports only the standard library, NumPy and ml_dtypes."""
