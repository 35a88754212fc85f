// main of the runtime tests (the Catch2 v2 session: catch_runner.cpp).
int catch_run(int argc, char* argv[]);

int main(int argc, char* argv[]) { return catch_run(argc, argv); }
