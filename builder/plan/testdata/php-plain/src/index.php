<?php
// A PHP app with no composer.json: the document root is the app itself. It writes
// into its own tree, as apps do with their caches.
file_put_contents(__DIR__ . '/visits.txt', "visited\n", FILE_APPEND);
header('Content-Type: text/plain');
echo 'hello from plain php ', PHP_MAJOR_VERSION, '.', PHP_MINOR_VERSION, ', ', count(file(__DIR__ . '/visits.txt')), " visit(s)\n";
