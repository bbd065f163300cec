"""The operator's edge: kopf handlers (the only importer of kopf) and the reconcile loop they drive."""
