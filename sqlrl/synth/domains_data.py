"""The concrete domains: shop (the existing demo database), library, clinic, flights, university, music.

Guarantees: each ``populate`` function draws only from the ``random.Random`` it is given, in a fixed
order (no set or hash iteration), so a seed fixes every row; foreign-key values are always drawn
from keys already generated; row counts scale with ``scale`` (at least 3 rows per table).
"""

from __future__ import annotations

import random
from datetime import date, timedelta

from ..tasks.demo_db import build_demo_database
from .domains_base import Column as C
from .domains_base import Domain, ForeignKey, Table, scaled

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Niklaus", "Radia",
         "Tim", "Margaret", "John", "Leslie", "Shafi", "Judea", "Yann", "Amara", "Andrew", "Daphne",
         "Kofi", "Mei", "Ravi", "Sofia", "Omar", "Ines", "Lars", "Yuki", "Chen", "Zara"]
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Wirth",
        "Perlman", "Hamilton", "McCarthy", "Lamport", "Goldwasser", "Pearl", "Okafor", "Tanaka",
        "Silva", "Novak", "Haddad", "Berg", "Kowalski", "Mensah", "Rossi"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quebec", "Dakar", "Tartu", "Porto", "Accra"]
COUNTRIES = ["Portugal", "Norway", "Kenya", "Peru", "Japan", "Canada", "Senegal", "Estonia",
             "Brazil", "Ghana", "Italy", "Poland"]


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def day(rng: random.Random, start: date, span_days: int) -> str:
    return (start + timedelta(days=rng.randrange(span_days))).isoformat()


def maybe(rng: random.Random, p_null: float, value):
    return None if rng.random() < p_null else value


def after(iso: str, rng: random.Random, lo: int, hi: int) -> str:
    return (date.fromisoformat(iso) + timedelta(days=rng.randint(lo, hi))).isoformat()


# --- shop: the existing demo database ---------------------------------------------------------------

def _build_shop(path: str, seed: int, scale: float) -> None:
    build_demo_database(path, seed, customers=scaled(60, scale), products=scaled(40, scale),
                        orders=scaled(300, scale))


SHOP = Domain(
    name="shop", description="an online shop: customers, products, orders and their items",
    tables=(
        Table("customers", "customer", "customers", (
            C("customer_id", "customer id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("email", "email address", "text", nullable=True),
            C("city", "city", "category", nullable=True),
            C("joined", "date they joined", "date", "DATE")), ("customer_id",)),
        Table("products", "product", "products", (
            C("product_id", "product id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("category", "category", "category"),
            C("price", "price", "measure", "REAL", unit="dollars"),
            C("stock", "number of items in stock", "measure", "INTEGER", nullable=True)), ("product_id",)),
        Table("orders", "order", "orders", (
            C("order_id", "order id", "id", "INTEGER"),
            C("customer_id", "customer", "fk", "INTEGER"),
            C("order_date", "order date", "date", "DATE"),
            C("status", "status", "category")), ("order_id",)),
        Table("order_items", "order item", "order items", (
            C("order_id", "order", "fk", "INTEGER"),
            C("product_id", "product", "fk", "INTEGER"),
            C("quantity", "quantity", "measure", "INTEGER"),
            C("unit_price", "unit price", "measure", "REAL", unit="dollars")), ("order_id", "product_id")),
    ),
    foreign_keys=(ForeignKey("orders", "customer_id", "customers", "customer_id"),
                  ForeignKey("order_items", "order_id", "orders", "order_id"),
                  ForeignKey("order_items", "product_id", "products", "product_id")),
    builder=_build_shop)


# --- library ----------------------------------------------------------------------------------------

GENRES = ["fantasy", "mystery", "history", "poetry", "science", "romance", "biography"]
TITLE_A = ["The Silent", "A Distant", "The Last", "Hidden", "The Broken", "Winter", "The Golden", "Lost"]
TITLE_B = ["River", "Garden", "Empire", "Harbor", "Letters", "Mountain", "Machine", "Archive", "Song"]
REVIEWS = ["loved the ending", "too long in the middle", "a classic", "recommended by a friend",
           "pages missing", "great for students", "slow start but worth it"]


def _library(rng: random.Random, scale: float) -> dict[str, list[tuple]]:
    n_auth, n_books, n_mem, n_loans = scaled(40, scale), scaled(150, scale), scaled(120, scale), scaled(600, scale)
    authors = [(i, person(rng), maybe(rng, 0.15, rng.choice(COUNTRIES)),
                maybe(rng, 0.2, rng.randint(1900, 1995))) for i in range(1, n_auth + 1)]
    books = []
    for i in range(1, n_books + 1):
        books.append((i, f"{rng.choice(TITLE_A)} {rng.choice(TITLE_B)}", rng.randint(1, n_auth),
                      rng.choice(GENRES), day(rng, date(1950, 1, 1), 26000), rng.randint(90, 900),
                      f"978-{rng.randint(0, 9)}-{rng.randint(1000, 9999)}-{i:04d}"))
    members = [(i, person(rng), maybe(rng, 0.1, rng.choice(CITIES)), day(rng, date(2018, 1, 1), 1800),
                rng.choice(["S", "P", "F", "S", "S"]), maybe(rng, 0.3, f"member{i}@example.org"))
               for i in range(1, n_mem + 1)]
    loans = []
    for i in range(1, n_loans + 1):
        out = day(rng, date(2021, 1, 1), 1000)
        due = after(out, rng, 28, 28)
        returned = maybe(rng, 0.2, after(out, rng, 1, 60))
        late = returned is not None and returned > due
        loans.append((i, rng.randint(1, n_books), rng.randint(1, n_mem), out, due, returned,
                      round(rng.uniform(0.5, 12), 2) if late else None,
                      maybe(rng, 0.7, rng.choice(REVIEWS))))
    return {"authors": authors, "books": books, "members": members, "loans": loans}


LIBRARY = Domain(
    name="library", description="a public library: authors, books, members and loans",
    tables=(
        Table("authors", "author", "authors", (
            C("author_id", "author id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("country", "country", "category", nullable=True),
            C("birth_year", "year of birth", "measure", "INTEGER", summable=False, nullable=True)), ("author_id",)),
        Table("books", "book", "books", (
            C("book_id", "book id", "id", "INTEGER"),
            C("title", "title", "name"),
            C("author_id", "author", "fk", "INTEGER"),
            C("genre", "genre", "category"),
            C("published", "publication date", "date", "DATE"),
            C("pages", "number of pages", "measure", "INTEGER"),
            C("isbn", "ISBN", "text")), ("book_id",)),
        Table("members", "member", "members", (
            C("member_id", "member id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("city", "city", "category", nullable=True),
            C("joined", "date they joined", "date", "DATE"),
            C("membership", "membership type", "category",
              codes=(("S", "standard"), ("P", "premium"), ("F", "family"))),
            C("email", "email address", "text", nullable=True)), ("member_id",)),
        Table("loans", "loan", "loans", (
            C("loan_id", "loan id", "id", "INTEGER"),
            C("book_id", "book", "fk", "INTEGER"),
            C("member_id", "member", "fk", "INTEGER"),
            C("loan_date", "loan date", "date", "DATE"),
            C("due_date", "due date", "date", "DATE"),
            C("returned_date", "return date", "date", "DATE", nullable=True),
            C("fine", "late fine", "measure", "REAL", nullable=True, unit="euros"),
            C("comment", "member's comment", "text", nullable=True)), ("loan_id",)),
    ),
    foreign_keys=(ForeignKey("books", "author_id", "authors", "author_id"),
                  ForeignKey("loans", "book_id", "books", "book_id"),
                  ForeignKey("loans", "member_id", "members", "member_id")),
    populate=_library)


# --- clinic -----------------------------------------------------------------------------------------

SPECIALTIES = ["cardiology", "dermatology", "pediatrics", "neurology", "oncology", "general practice"]
DRUGS = ["amoxicillin", "ibuprofen", "metformin", "lisinopril", "atorvastatin", "omeprazole", "cetirizine"]
NOTES = ["follow-up in two weeks", "patient reports mild pain", "routine check", "refer to specialist",
         "blood test ordered", "symptoms improved", "allergic reaction noted"]


def _clinic(rng: random.Random, scale: float) -> dict[str, list[tuple]]:
    n_doc, n_pat, n_app, n_rx = scaled(25, scale), scaled(200, scale), scaled(700, scale), scaled(500, scale)
    doctors = [(i, "Dr. " + person(rng), rng.choice(SPECIALTIES), day(rng, date(2000, 1, 1), 8000),
                rng.randrange(90, 300) * 1000) for i in range(1, n_doc + 1)]
    patients = [(i, person(rng), day(rng, date(1940, 1, 1), 29000), rng.choice(["F", "M"]),
                 maybe(rng, 0.1, rng.choice(CITIES)),
                 maybe(rng, 0.25, rng.choice(["A+", "A-", "B+", "O+", "O-", "AB+"])))
                for i in range(1, n_pat + 1)]
    apps = [(i, rng.randint(1, n_pat), rng.randint(1, n_doc), day(rng, date(2022, 1, 1), 900),
             rng.choice([0, 1, 1, 1, 2]), rng.choice([40, 60, 60, 80, 120, 150]),
             maybe(rng, 0.4, rng.choice(NOTES))) for i in range(1, n_app + 1)]
    rxs = [(i, rng.randint(1, n_app), rng.choice(DRUGS), rng.choice([5, 10, 20, 50, 100, 250, 500]),
            rng.choice([3, 5, 7, 10, 14, 30]), maybe(rng, 0.5, rng.choice([0, 1, 2])))
           for i in range(1, n_rx + 1)]
    return {"doctors": doctors, "patients": patients, "appointments": apps, "prescriptions": rxs}


CLINIC = Domain(
    name="clinic", description="a medical clinic: doctors, patients, appointments and prescriptions",
    tables=(
        Table("doctors", "doctor", "doctors", (
            C("doctor_id", "doctor id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("specialty", "specialty", "category"),
            C("hire_date", "hire date", "date", "DATE"),
            C("salary", "yearly salary", "measure", "INTEGER", unit="dollars")), ("doctor_id",)),
        Table("patients", "patient", "patients", (
            C("patient_id", "patient id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("birth_date", "date of birth", "date", "DATE"),
            C("sex", "sex", "category", codes=(("F", "female"), ("M", "male"))),
            C("city", "city", "category", nullable=True),
            C("blood_type", "blood type", "category", nullable=True)), ("patient_id",)),
        Table("appointments", "appointment", "appointments", (
            C("appointment_id", "appointment id", "id", "INTEGER"),
            C("patient_id", "patient", "fk", "INTEGER"),
            C("doctor_id", "doctor", "fk", "INTEGER"),
            C("appointment_date", "appointment date", "date", "DATE"),
            C("status", "status", "category", "INTEGER",
              codes=((0, "scheduled"), (1, "completed"), (2, "cancelled"))),
            C("fee", "fee", "measure", "INTEGER", unit="dollars"),
            C("notes", "doctor's notes", "text", nullable=True)), ("appointment_id",)),
        Table("prescriptions", "prescription", "prescriptions", (
            C("prescription_id", "prescription id", "id", "INTEGER"),
            C("appointment_id", "appointment", "fk", "INTEGER"),
            C("drug", "drug", "category"),
            C("dose_mg", "dose", "measure", "INTEGER", unit="milligrams"),
            C("days", "treatment length in days", "measure", "INTEGER"),
            C("refills", "number of refills", "measure", "INTEGER", nullable=True)), ("prescription_id",)),
    ),
    foreign_keys=(ForeignKey("appointments", "patient_id", "patients", "patient_id"),
                  ForeignKey("appointments", "doctor_id", "doctors", "doctor_id"),
                  ForeignKey("prescriptions", "appointment_id", "appointments", "appointment_id")),
    populate=_clinic)


# --- flights ----------------------------------------------------------------------------------------

AIRPORTS = [("LIS", "Humberto Delgado", "Lisbon", "Portugal"), ("OSL", "Gardermoen", "Oslo", "Norway"),
            ("NBO", "Jomo Kenyatta", "Nairobi", "Kenya"), ("LIM", "Jorge Chavez", "Lima", "Peru"),
            ("KIX", "Kansai", "Osaka", "Japan"), ("YQB", "Jean Lesage", "Quebec", "Canada"),
            ("DSS", "Blaise Diagne", "Dakar", "Senegal"), ("TLL", "Lennart Meri", "Tallinn", "Estonia"),
            ("OPO", "Francisco Sa Carneiro", "Porto", "Portugal"), ("ACC", "Kotoka", "Accra", "Ghana"),
            ("NRT", "Narita", "Tokyo", "Japan"), ("YUL", "Trudeau", "Montreal", "Canada")]
AIRLINES = ["Aurora Air", "Blue Heron", "Cobalt Wings", "Delta Kite", "Equator Jet", "Fjord Lines",
            "Granite Air", "Harbor Hop"]


def _flights(rng: random.Random, scale: float) -> dict[str, list[tuple]]:
    airports = [(code, f"{name} Airport", city, country) for code, name, city, country in AIRPORTS]
    airlines = [(i + 1, name, rng.choice(COUNTRIES), maybe(rng, 0.25, rng.randint(1950, 2015)))
                for i, name in enumerate(AIRLINES)]
    n_fl, n_pax, n_bk = scaled(300, scale), scaled(250, scale), scaled(900, scale)
    codes = [a[0] for a in AIRPORTS]
    flights = []
    for i in range(1, n_fl + 1):
        origin, dest = rng.sample(codes, 2)
        dist = rng.randrange(300, 12000, 10)
        flights.append((i, rng.randint(1, len(AIRLINES)), f"{chr(65 + i % 26)}{chr(65 + (i * 7) % 26)}{100 + i}",
                        origin, dest, day(rng, date(2023, 1, 1), 500), dist, dist // 12 + rng.randint(20, 60),
                        rng.choice(["on time", "on time", "on time", "delayed", "cancelled"])))
    pax = [(i, person(rng), maybe(rng, 0.1, rng.choice(COUNTRIES)), day(rng, date(1945, 1, 1), 25000),
            maybe(rng, 0.6, rng.choice(["gold", "silver", "bronze"]))) for i in range(1, n_pax + 1)]
    bookings = [(i, rng.randint(1, n_fl), rng.randint(1, n_pax),
                 rng.choice(["E", "E", "E", "E", "B", "F"]), round(rng.uniform(40, 2500), 2),
                 day(rng, date(2022, 9, 1), 600), maybe(rng, 0.5, f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}"))
                for i in range(1, n_bk + 1)]
    return {"airports": airports, "airlines": airlines, "flights": flights, "passengers": pax,
            "bookings": bookings}


FLIGHTS = Domain(
    name="flights", description="an airline booking system: airports, airlines, flights, passengers, bookings",
    tables=(
        Table("airports", "airport", "airports", (
            C("airport_code", "airport code", "id"),
            C("name", "name", "name"),
            C("city", "city", "category"),
            C("country", "country", "category")), ("airport_code",)),
        Table("airlines", "airline", "airlines", (
            C("airline_id", "airline id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("country", "home country", "category"),
            C("founded", "founding year", "measure", "INTEGER", summable=False, nullable=True)), ("airline_id",)),
        Table("flights", "flight", "flights", (
            C("flight_id", "flight id", "id", "INTEGER"),
            C("airline_id", "airline", "fk", "INTEGER"),
            C("flight_number", "flight number", "name"),
            C("origin", "origin airport", "fk"),
            C("destination", "destination airport", "fk"),
            C("departure_date", "departure date", "date", "DATE"),
            C("distance_km", "distance", "measure", "INTEGER", unit="kilometres"),
            C("duration_min", "duration", "measure", "INTEGER", unit="minutes"),
            C("status", "status", "category")), ("flight_id",)),
        Table("passengers", "passenger", "passengers", (
            C("passenger_id", "passenger id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("nationality", "nationality", "category", nullable=True),
            C("birth_date", "date of birth", "date", "DATE"),
            C("loyalty_tier", "loyalty tier", "category", nullable=True)), ("passenger_id",)),
        Table("bookings", "booking", "bookings", (
            C("booking_id", "booking id", "id", "INTEGER"),
            C("flight_id", "flight", "fk", "INTEGER"),
            C("passenger_id", "passenger", "fk", "INTEGER"),
            C("seat_class", "seat class", "category",
              codes=(("E", "economy"), ("B", "business"), ("F", "first class"))),
            C("price", "ticket price", "measure", "REAL", unit="dollars"),
            C("booked_on", "booking date", "date", "DATE"),
            C("seat", "seat", "text", nullable=True)), ("booking_id",)),
    ),
    foreign_keys=(ForeignKey("flights", "airline_id", "airlines", "airline_id"),
                  ForeignKey("flights", "origin", "airports", "airport_code"),
                  ForeignKey("flights", "destination", "airports", "airport_code"),
                  ForeignKey("bookings", "flight_id", "flights", "flight_id"),
                  ForeignKey("bookings", "passenger_id", "passengers", "passenger_id")),
    populate=_flights)


# --- university -------------------------------------------------------------------------------------

DEPARTMENTS = [("Physics", "Newton Hall"), ("History", "Clio House"), ("Biology", "Darwin Wing"),
               ("Computer Science", "Turing Building"), ("Economics", "Smith Hall"),
               ("Mathematics", "Newton Hall"), ("Music", "Clio House")]
COURSE_WORDS = ["Introduction to", "Advanced", "Topics in", "Foundations of", "Seminar on"]
SUBJECTS = ["Mechanics", "Algorithms", "Genetics", "Markets", "Harmony", "Revolutions", "Topology",
            "Ecology", "Databases", "Optics"]


def _university(rng: random.Random, scale: float) -> dict[str, list[tuple]]:
    depts = [(i + 1, name, building, rng.randrange(200, 2000) * 1000)
             for i, (name, building) in enumerate(DEPARTMENTS)]
    nd = len(depts)
    n_ins, n_stu, n_crs, n_enr = scaled(40, scale), scaled(300, scale), scaled(60, scale), scaled(1200, scale)
    instructors = [(i, person(rng), rng.randint(1, nd), day(rng, date(1995, 1, 1), 10000),
                    rng.randrange(50, 180) * 1000, rng.choice(["assistant", "associate", "full", "full"]))
                   for i in range(1, n_ins + 1)]
    students = [(i, person(rng), rng.randint(1, nd), rng.randint(2019, 2024),
                 maybe(rng, 0.15, round(rng.uniform(1.5, 4.0), 2)),
                 maybe(rng, 0.2, f"s{i:05d}@uni.example.edu")) for i in range(1, n_stu + 1)]
    courses = [(i, f"{rng.choice(COURSE_WORDS)} {rng.choice(SUBJECTS)}", rng.randint(1, nd),
                maybe(rng, 0.1, rng.randint(1, n_ins)), rng.choice([3, 4, 4, 5, 6]))
               for i in range(1, n_crs + 1)]
    seen, enrollments = set(), []
    semesters = ["2022-fall", "2023-spring", "2023-fall", "2024-spring"]
    while len(enrollments) < n_enr:
        key = (rng.randint(1, n_stu), rng.randint(1, n_crs), rng.choice(semesters))
        if key in seen:
            continue
        seen.add(key)
        enrollments.append((*key, maybe(rng, 0.15, rng.choice("AABBBCCDF")),
                            day(rng, date(2022, 8, 1), 700)))
    return {"departments": depts, "instructors": instructors, "students": students,
            "courses": courses, "enrollments": enrollments}


UNIVERSITY = Domain(
    name="university", description="a university: departments, instructors, students, courses, enrollments",
    tables=(
        Table("departments", "department", "departments", (
            C("dept_id", "department id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("building", "building", "category"),
            C("budget", "budget", "measure", "INTEGER", unit="dollars")), ("dept_id",)),
        Table("instructors", "instructor", "instructors", (
            C("instructor_id", "instructor id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("dept_id", "department", "fk", "INTEGER"),
            C("hire_date", "hire date", "date", "DATE"),
            C("salary", "salary", "measure", "INTEGER", unit="dollars"),
            C("rank", "academic rank", "category")), ("instructor_id",)),
        Table("students", "student", "students", (
            C("student_id", "student id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("dept_id", "major department", "fk", "INTEGER"),
            C("enrollment_year", "year of enrollment", "measure", "INTEGER", summable=False),
            C("gpa", "GPA", "measure", "REAL", nullable=True),
            C("email", "email address", "text", nullable=True)), ("student_id",)),
        Table("courses", "course", "courses", (
            C("course_id", "course id", "id", "INTEGER"),
            C("title", "title", "name"),
            C("dept_id", "department", "fk", "INTEGER"),
            C("instructor_id", "instructor", "fk", "INTEGER", nullable=True),
            C("credits", "number of credits", "measure", "INTEGER")), ("course_id",)),
        Table("enrollments", "enrollment", "enrollments", (
            C("student_id", "student", "fk", "INTEGER"),
            C("course_id", "course", "fk", "INTEGER"),
            C("semester", "semester", "category"),
            C("grade", "grade", "category", nullable=True),
            C("enrolled_on", "enrollment date", "date", "DATE")), ("student_id", "course_id", "semester")),
    ),
    foreign_keys=(ForeignKey("instructors", "dept_id", "departments", "dept_id"),
                  ForeignKey("students", "dept_id", "departments", "dept_id"),
                  ForeignKey("courses", "dept_id", "departments", "dept_id"),
                  ForeignKey("courses", "instructor_id", "instructors", "instructor_id"),
                  ForeignKey("enrollments", "student_id", "students", "student_id"),
                  ForeignKey("enrollments", "course_id", "courses", "course_id")),
    populate=_university)


# --- music streaming --------------------------------------------------------------------------------

MUSIC_GENRES = ["jazz", "rock", "hip hop", "classical", "electronic", "folk", "pop"]
BAND_A = ["Velvet", "Electric", "Midnight", "Paper", "Neon", "Crystal", "Wild", "Quiet"]
BAND_B = ["Owls", "Engines", "Tides", "Lanterns", "Foxes", "Echoes", "Pilots"]
ALBUM_WORDS = ["Sessions", "Stories", "Live", "Vol. 2", "Diaries"]
TRACK_WORDS = ["of Mine", "Again", "Tonight", "Song", "Blues"]
SONG = ["Love", "Night", "Road", "Fire", "Rain", "Dream", "Light", "Home", "Ocean", "Storm"]


def _music(rng: random.Random, scale: float) -> dict[str, list[tuple]]:
    n_art, n_alb, n_trk = scaled(30, scale), scaled(80, scale), scaled(500, scale)
    n_usr, n_play = scaled(150, scale), scaled(2000, scale)
    artists = [(i, f"The {rng.choice(BAND_A)} {rng.choice(BAND_B)}" if rng.random() < 0.6 else person(rng),
                maybe(rng, 0.15, rng.choice(COUNTRIES)), maybe(rng, 0.2, rng.randint(1960, 2020)))
               for i in range(1, n_art + 1)]
    albums = [(i, rng.randint(1, n_art), f"{rng.choice(SONG)} {rng.choice(ALBUM_WORDS)}",
               day(rng, date(1975, 1, 1), 17000), rng.choice(MUSIC_GENRES)) for i in range(1, n_alb + 1)]
    tracks = [(i, rng.randint(1, n_alb), f"{rng.choice(SONG)} {rng.choice(TRACK_WORDS)}",
               rng.randint(95, 520), rng.choice([0, 0, 0, 1]), rng.randint(1, 14)) for i in range(1, n_trk + 1)]
    users = [(i, f"{rng.choice(FIRST).lower()}{rng.randint(1, 999)}", maybe(rng, 0.1, rng.choice(COUNTRIES)),
              day(rng, date(2019, 1, 1), 1800), rng.choice(["free", "free", "premium", "family"]))
             for i in range(1, n_usr + 1)]
    plays = [(i, rng.randint(1, n_usr), rng.randint(1, n_trk), day(rng, date(2024, 1, 1), 365),
              rng.randint(5, 520), maybe(rng, 0.3, rng.choice(["mobile", "desktop", "smart speaker"])))
             for i in range(1, n_play + 1)]
    return {"artists": artists, "albums": albums, "tracks": tracks, "users": users, "plays": plays}


MUSIC = Domain(
    name="music", description="a music streaming service: artists, albums, tracks, users and plays",
    tables=(
        Table("artists", "artist", "artists", (
            C("artist_id", "artist id", "id", "INTEGER"),
            C("name", "name", "name"),
            C("country", "country", "category", nullable=True),
            C("formed_year", "year formed", "measure", "INTEGER", summable=False, nullable=True)), ("artist_id",)),
        Table("albums", "album", "albums", (
            C("album_id", "album id", "id", "INTEGER"),
            C("artist_id", "artist", "fk", "INTEGER"),
            C("title", "title", "name"),
            C("release_date", "release date", "date", "DATE"),
            C("genre", "genre", "category")), ("album_id",)),
        Table("tracks", "track", "tracks", (
            C("track_id", "track id", "id", "INTEGER"),
            C("album_id", "album", "fk", "INTEGER"),
            C("title", "title", "name"),
            C("duration_s", "length", "measure", "INTEGER", unit="seconds"),
            C("explicit", "explicit flag", "category", "INTEGER",
              codes=((1, "explicit"), (0, "not explicit"))),
            C("track_number", "track number", "measure", "INTEGER", summable=False)), ("track_id",)),
        Table("users", "user", "users", (
            C("user_id", "user id", "id", "INTEGER"),
            C("username", "username", "name"),
            C("country", "country", "category", nullable=True),
            C("signup_date", "sign-up date", "date", "DATE"),
            C("plan", "subscription plan", "category")), ("user_id",)),
        Table("plays", "play", "plays", (
            C("play_id", "play id", "id", "INTEGER"),
            C("user_id", "user", "fk", "INTEGER"),
            C("track_id", "track", "fk", "INTEGER"),
            C("played_on", "play date", "date", "DATE"),
            C("seconds_played", "listening time", "measure", "INTEGER", unit="seconds"),
            C("device", "device", "category", nullable=True)), ("play_id",)),
    ),
    foreign_keys=(ForeignKey("albums", "artist_id", "artists", "artist_id"),
                  ForeignKey("tracks", "album_id", "albums", "album_id"),
                  ForeignKey("plays", "user_id", "users", "user_id"),
                  ForeignKey("plays", "track_id", "tracks", "track_id")),
    populate=_music)


ALL = (SHOP, LIBRARY, CLINIC, FLIGHTS, UNIVERSITY, MUSIC)
