<?php
// The front controller, in public/: the document root.
require __DIR__ . '/../vendor/autoload.php';

header('Content-Type: text/plain');
echo App\Greeter::hello(), ' as uid ', posix_getuid(), "\n";
