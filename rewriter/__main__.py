from deepstack_patch.cli import main

main()
