from bayesurl.cli import console_main

console_main()
