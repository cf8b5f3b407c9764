package main

import "example.com/shop"

func main() { println(shop.Greeting()) }
