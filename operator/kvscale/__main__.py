from kvscale.cli import main

raise SystemExit(main())
