// stand-in for the Yarn release
