from denv.cli import main

raise SystemExit(main())
