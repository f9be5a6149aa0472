from preflight.quick import main

main()
