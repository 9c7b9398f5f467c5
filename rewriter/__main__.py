from deepstack_patch.entry import main

main()
