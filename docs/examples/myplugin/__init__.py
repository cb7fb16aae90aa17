"""A plugin that brings its own version of a whole module of mypkg."""
