<?php

namespace App;

final class Greeter
{
    public static function hello(): string
    {
        return 'hello from php ' . PHP_MAJOR_VERSION . '.' . PHP_MINOR_VERSION . ' with composer\'s autoloader';
    }
}
